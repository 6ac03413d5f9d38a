//! Dynamic MIG: what a MIG-capable GPU can be carved into, and the calls that carve it.
//!
//! A GPU in MIG mode is divided into GPU instances (GI), each at a *placement*: a run of
//! the GPU's memory slices (`start`, `size`; 8 memory slices on A100 and H100). A GI
//! profile says how much compute and memory a GI gets and where it may be placed; a
//! compute instance (CI) inside the GI runs the work. edra creates one GI with one CI
//! covering all of it per MIG device a claim is allocated, and destroys both when the
//! claim is unprepared.
//!
//! [`MigControl`] is implemented by the device backends: NVML (raw calls through
//! nvml-wrapper-sys, since nvml-wrapper 0.13 has no safe GI/CI API) and the mock (which
//! keeps its instances in its own state). Nothing here records anything: the caller
//! records what it is about to create or destroy (in [`crate::state`]) before it calls in
//! here. [`profiles`] holds NVIDIA's profile tables for the GPUs the mock backend can
//! emulate.

pub mod profiles;

use serde::{Deserialize, Serialize};

/// Where a GPU instance sits: memory slices `start .. start + size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl Placement {
    /// Whether the two placements share a memory slice.
    pub fn overlaps(&self, other: &Placement) -> bool {
        let end = |p: &Placement| p.start.saturating_add(p.size);
        self.start < end(other) && other.start < end(self)
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.start, self.size)
    }
}

/// A GPU instance profile a GPU supports (`nvmlGpuInstanceProfileInfo_t` and its placements).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// The name NVIDIA's tools use, e.g. `1g.10gb`, `1g.10gb+me`, `3g.40gb`.
    pub name: String,
    /// The profile index (`NVML_GPU_INSTANCE_PROFILE_*`, 0x0 for 1 slice, 0x7 for 1 slice
    /// with media extensions, ...), as `nvmlDeviceGetGpuInstanceProfileInfo` takes it.
    pub index: u32,
    /// The profile ID (`info.id`), as the create and placement calls take it.
    pub id: u32,
    /// Compute slices of a GI of this profile (the `1` of `1g`).
    pub slices: u32,
    /// Most GIs of this profile on the GPU at once.
    pub instances: u32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical flow accelerators.
    pub ofa_engines: u32,
    /// Memory in bytes (`memorySizeMB` × 2^20).
    pub memory: u64,
    /// Where a GI of this profile may be placed, ordered by start.
    pub placements: Vec<Placement>,
}

/// What a MIG-capable GPU in MIG mode can be carved into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigCapability {
    /// Memory slices of the GPU (the largest placement end over all profiles).
    pub memory_slices: u32,
    /// The GI profiles, ordered by profile ID.
    pub profiles: Vec<MigProfile>,
}

impl MigCapability {
    /// The profile with ID `id`.
    pub fn profile(&self, id: u32) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }
}

/// A MIG instance that exists on a GPU: a GPU instance and, when it has one, its first
/// compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    /// GPU instance ID.
    pub gi: u32,
    /// GI profile ID.
    pub profile_id: u32,
    /// Where the GI sits.
    pub placement: Placement,
    /// The compute instance ID, when the GI has a compute instance.
    pub ci: Option<u32>,
    /// The MIG device's UUID (`MIG-...`), when the GI has a compute instance.
    pub uuid: Option<String>,
}

/// Why a MIG instance could not be created, destroyed or listed.
#[derive(Debug, thiserror::Error)]
pub enum MigError {
    /// The GPU is not known to the backend.
    #[error("GPU {uuid} is not on this node (any more)")]
    UnknownGpu {
        /// The GPU's UUID.
        uuid: String,
    },
    /// The GPU is not in MIG mode (or not MIG capable).
    #[error("GPU {uuid} is not in MIG mode; enable it with `nvidia-smi -i {uuid} -mig 1` (a GPU reset may be needed)")]
    MigModeOff {
        /// The GPU's UUID.
        uuid: String,
    },
    /// The placement is taken (NVML `INSUFFICIENT_RESOURCES`).
    #[error(
        "GPU {uuid} has no room for MIG profile {profile} at placement {placement}: another MIG instance \
         occupies those memory slices (NVML: insufficient resources)"
    )]
    Occupied {
        /// The GPU's UUID.
        uuid: String,
        /// The profile name.
        profile: String,
        /// The placement asked for.
        placement: Placement,
    },
    /// The driver's NVML lacks a function dynamic MIG needs.
    #[error("the NVML library lacks {call}, which dynamic MIG needs; update the NVIDIA driver (R470 or newer)")]
    Unsupported {
        /// The missing function.
        call: &'static str,
    },
    /// An NVML call failed.
    #[error("NVML {call} failed for GPU {uuid}: {message}")]
    Nvml {
        /// The NVML function.
        call: &'static str,
        /// The GPU's UUID.
        uuid: String,
        /// NVML's error text.
        message: String,
    },
    /// The mock backend's MIG state could not be read or written.
    #[error("mock MIG state {path}: {message}")]
    MockState {
        /// The state file.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Creates, lists and destroys MIG instances on GPUs in MIG mode.
pub trait MigControl: Send + Sync {
    /// The MIG instances on GPU `uuid` now (edra's and others'), ordered by GI ID.
    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, MigError>;
    /// Creates a GPU instance of `profile` at `placement` on GPU `uuid` and one compute
    /// instance covering all of it; returns the instance with its IDs and MIG UUID. On an
    /// error nothing is left behind (a GI whose CI could not be created is destroyed again).
    fn create_mig(&self, uuid: &str, profile: &MigProfile, placement: Placement) -> Result<MigInstance, MigError>;
    /// Destroys compute instance `ci` (when given) and then GPU instance `gi` on GPU `uuid`.
    /// An instance that no longer exists counts as destroyed.
    fn destroy_mig(&self, uuid: &str, gi: u32, ci: Option<u32>) -> Result<(), MigError>;
}
