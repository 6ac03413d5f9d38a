//! The settings types of the sections whose logic lives in the rooms that use them:
//! `[sharing]` (offered by the `sharing` module), `[mig]` (the `mig` module), `[claims]`
//! (`prepare::stale`) and the XIDs `[health]` ignores by default. Plain data with
//! their defaults; the logic that reads them is implemented where it is used, so config
//! imports no domain module.

use std::time::Duration;

use crate::device_config::Interval;

/// How the selected full GPUs are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharingMode {
    /// Consumable capacity: many claims per GPU, each with a share of its memory.
    Shares,
    /// `sharing.replicas` devices per GPU.
    Replicas,
    /// One device per GPU, one claim at a time.
    Exclusive,
}

/// What shares become where the API server drops consumable capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Plain exclusive GPUs.
    Exclusive,
    /// Replicas.
    Replicas,
}

/// Which full GPUs `sharing.mode` applies to; the others are exclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelection {
    /// Every full GPU.
    All,
    /// GPUs named by device name (`gpu-0`) or UUID.
    Listed(Vec<String>),
}

/// `[sharing]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingSettings {
    /// How selected GPUs are published.
    pub mode: SharingMode,
    /// The GPUs `mode` applies to.
    pub gpus: GpuSelection,
    /// Shares are rounded up to a multiple of this many bytes (whole MiB).
    pub memory_step: u64,
    /// Devices per GPU in replicas mode (and the replicas fallback).
    pub replicas: u32,
    /// What shares become on a server without consumable capacity.
    pub fallback: Fallback,
    /// What edra does to a shared GPU while shares of it are prepared.
    pub enforcement: Enforcement,
    /// Whether each share's memory is a kernel-enforced limit on its containers' cgroups.
    pub memory_limit: MemoryLimit,
}

/// `sharing.memory_limit`: whether a share's memory is enforced per container by the
/// driver's cgroup memory limits (orthogonal to `enforcement`, which is about compute).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemoryLimit {
    /// Accounting only (with `enforcement = "mps"`, the MPS pinned-memory variable).
    #[default]
    Advisory,
    /// Every share's containers get a hard GPU memory limit on their cgroup; a node that
    /// cannot set one refuses to start.
    Enforced,
    /// Enforced where the node can, advisory (with a warning) where it cannot.
    Auto,
}

impl MemoryLimit {
    /// The configuration value: `advisory`, `enforced` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryLimit::Advisory => "advisory",
            MemoryLimit::Enforced => "enforced",
            MemoryLimit::Auto => "auto",
        }
    }
}

/// `sharing.enforcement`: what edra sets on a shared GPU from its first share to its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Enforcement {
    /// Nothing: accounting only.
    #[default]
    None,
    /// Compute mode DEFAULT and this time-slice (`sharing.timeslice`); still accounting
    /// only for memory.
    TimeSlicing(Interval),
    /// One MPS control daemon per shared GPU (compute mode EXCLUSIVE_PROCESS), each share's
    /// pinned device memory limited to its consumed memory.
    Mps,
}

impl Enforcement {
    /// The configuration value: `none`, `timeslicing` or `mps`.
    pub fn name(self) -> &'static str {
        match self {
            Enforcement::None => "none",
            Enforcement::TimeSlicing(_) => "timeslicing",
            Enforcement::Mps => "mps",
        }
    }

    /// The time-slice, in timeslicing enforcement.
    pub fn timeslice(self) -> Option<Interval> {
        match self {
            Enforcement::TimeSlicing(i) => Some(i),
            _ => None,
        }
    }
}

impl Default for SharingSettings {
    fn default() -> Self {
        Self {
            mode: SharingMode::Shares,
            gpus: GpuSelection::All,
            memory_step: 1 << 30,
            replicas: 4,
            fallback: Fallback::Exclusive,
            enforcement: Enforcement::None,
            memory_limit: MemoryLimit::Advisory,
        }
    }
}

/// `[mig]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSettings {
    /// GPUs whose MIG devices are created on demand (dynamic MIG); the others are
    /// published as they are (static).
    pub dynamic: GpuSelection,
}

impl Default for MigSettings {
    fn default() -> Self {
        Self { dynamic: GpuSelection::Listed(Vec::new()) }
    }
}

/// How often and how patiently claims are checked (`[claims]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleSettings {
    /// How often prepared claims are checked against the API server.
    pub check_interval: Duration,
    /// How long a claim must stay gone before it is released.
    pub release_after: Duration,
}

impl Default for StaleSettings {
    fn default() -> Self {
        Self { check_interval: Duration::from_secs(300), release_after: Duration::from_secs(120) }
    }
}

/// The application-level XIDs ignored by default (as NVIDIA's device plugin does): 13
/// graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45
/// preemptive cleanup, 68 video processor exception, 109 context switch timeout.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
