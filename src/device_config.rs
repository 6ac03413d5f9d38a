//! The opaque device configuration a claim can carry (`GpuConfig`): plain data, shared by
//! prepare (which decodes and resolves it from the claim, see `prepare::config`) and state
//! (which records the resolved value with each prepared device). It imports nothing of edra,
//! so neither of the two depends on the other through it.

use serde::{Deserialize, Serialize};

/// How a GPU is shared between containers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Strategy {
    /// One claim owns the GPU.
    #[default]
    Exclusive,
    /// CUDA time-slicing.
    TimeSlicing,
    /// CUDA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
}

impl std::fmt::Display for Strategy {
    /// The name as written in a claim's configuration (`"MPS"`, not `Mps`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Strategy::Exclusive => "Exclusive",
            Strategy::TimeSlicing => "TimeSlicing",
            Strategy::Mps => "MPS",
        })
    }
}

/// Time-slice length for `TimeSlicing`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Interval {
    /// The driver's default.
    #[default]
    Default,
    /// Short slices.
    Short,
    /// Medium slices.
    Medium,
    /// Long slices.
    Long,
}

/// `sharing.timeSlicing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    /// The slice length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Interval>,
}

/// `sharing.mps`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsConfig {
    /// Percentage of SMs each client may use (1–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<u32>,
    /// Pinned device memory limit per client, a Kubernetes quantity (e.g. `10Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<String>,
    /// Per-GPU overrides of the pinned device memory limit: device name (`gpu-0`) or UUID
    /// → quantity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_per_device_pinned_memory_limit: Option<std::collections::BTreeMap<String, String>>,
}

/// `sharing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sharing {
    /// The strategy.
    #[serde(default)]
    pub strategy: Strategy,
    /// Settings for `TimeSlicing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicingConfig>,
    /// Settings for `MPS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsConfig>,
}

/// The resolved configuration of one allocated device (the `GpuConfig` body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuConfig {
    /// How the GPU is shared.
    #[serde(default)]
    pub sharing: Sharing,
}
