//! Actuators with side effects on a GPU, each behind a narrow trait with a stand-in for
//! tests. Prepare decides what a claim needs; these carry it out. Nothing here knows
//! claims or the API server, and nothing here records anything: the caller records what
//! it is about to change (in [`crate::state`]) before it calls in here.
//!
//! - [`ComputeModes`]: a GPU's compute mode, through NVML (`nvml` backend) or the mock
//!   backend's own memory.
//! - [`timeslice::NvidiaSmi`]: the time-slice interval, through the host's `nvidia-smi`
//!   (NVML has no call for it).
//! - [`mig_control::MigControl`]: MIG GPU and compute instances (dynamic MIG), through NVML or
//!   the mock backend's own state.
//! - [`mps::MpsDaemons`]: per-claim MPS control daemons (start, check, stop).
//! - [`memory_limit::LimitControl`]: GPU memory limits per cgroup, through NVML.

pub mod memory_limit;
pub mod mig_control;
pub mod mps;
pub mod timeslice;

use serde::{Deserialize, Serialize};

/// A GPU's compute mode (`nvmlComputeMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ComputeMode {
    /// Many contexts per GPU, from any process (the driver's default).
    Default,
    /// One context, one thread (removed from current drivers; kept to restore it faithfully).
    ExclusiveThread,
    /// No contexts.
    Prohibited,
    /// One process (or the MPS server) per GPU.
    ExclusiveProcess,
}

/// Why a GPU could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The GPU is not known to the backend.
    #[error("GPU {uuid} is not on this node (any more)")]
    UnknownGpu {
        /// The GPU's UUID.
        uuid: String,
    },
    /// An NVML call failed.
    #[error("NVML {call} failed for GPU {uuid}; edra must run as root to change compute modes")]
    Nvml {
        /// The NVML function.
        call: &'static str,
        /// The GPU's UUID.
        uuid: String,
        /// NVML's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The binary is not there.
    #[error("{} does not exist or is not an executable file; install the NVIDIA driver's utilities or set {key}", path.display())]
    MissingBinary {
        /// The path looked at.
        path: std::path::PathBuf,
        /// The config key that sets it.
        key: &'static str,
    },
    /// The command could not be started or waited for.
    #[error("cannot run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The command failed.
    #[error("`{command}` failed with {status}: {}", if stderr.is_empty() { "(no output on stderr)" } else { stderr.as_str() })]
    Command {
        /// The command line.
        command: String,
        /// Its exit status (`exit status 3`, `signal 9`).
        status: String,
        /// Its standard error, trimmed and bounded.
        stderr: String,
    },
    /// The command did not finish in time and was killed.
    #[error("`{command}` did not finish within {seconds} s and was killed; check the GPU and its driver (nvidia-smi)")]
    Timeout {
        /// The command line.
        command: String,
        /// The bound.
        seconds: u64,
    },
    /// The GPU has no such setting (a Jetson's integrated GPU has no compute modes).
    #[error("GPU {uuid} cannot {what}: {why}")]
    Unsupported {
        /// The GPU's UUID.
        uuid: String,
        /// What was asked, e.g. `set the compute mode to ExclusiveProcess`.
        what: String,
        /// Why the platform cannot.
        why: &'static str,
    },
}

/// Reads and sets GPUs' compute modes. Implemented by the device backends; the mock keeps
/// the modes in its own memory, so tests and demos see the effect without hardware.
pub trait ComputeModes: Send + Sync {
    /// The compute mode of the full GPU `uuid`.
    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError>;
    /// Sets the compute mode of the full GPU `uuid` (effective at once; not kept across reboots).
    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError>;
}

/// A GPU setting edra changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// The compute mode (NVML).
    ComputeMode,
    /// The time-slice interval (nvidia-smi).
    Timeslice,
}

/// How many GPU setting changes edra made or tried, for the metrics.
#[derive(Debug, Default)]
pub struct ChangeCounts {
    counts: [std::sync::atomic::AtomicU64; 4],
}

impl ChangeCounts {
    fn slot(setting: Setting, ok: bool) -> usize {
        (match setting {
            Setting::ComputeMode => 0,
            Setting::Timeslice => 2,
        }) + usize::from(!ok)
    }

    /// Counts one change of `setting` that succeeded (`ok`) or failed.
    pub fn record(&self, setting: Setting, ok: bool) {
        self.counts[Self::slot(setting, ok)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// `(setting, outcome, count)` for every combination.
    pub fn snapshot(&self) -> [(&'static str, &'static str, u64); 4] {
        let n = |setting, ok| self.counts[Self::slot(setting, ok)].load(std::sync::atomic::Ordering::Relaxed);
        [
            ("compute_mode", "ok", n(Setting::ComputeMode, true)),
            ("compute_mode", "failed", n(Setting::ComputeMode, false)),
            ("timeslice", "ok", n(Setting::Timeslice, true)),
            ("timeslice", "failed", n(Setting::Timeslice, false)),
        ]
    }
}

/// Folders, relative to the driver root, where the driver's tools are looked for when no
/// path is configured: distribution packages (`usr/bin`), driver containers and
/// `/usr/local/nvidia` roots (`bin`), and `/usr/local/nvidia` under `/`.
pub const TOOL_DIRS: [&str; 4] = ["usr/bin", "bin", "usr/local/nvidia/bin", "usr/sbin"];

/// The driver tool `relative` (`usr/bin/<name>`) under `driver_root`: the first of
/// [`TOOL_DIRS`] that holds the file, else `driver_root/relative` (named in the error when
/// it is missing).
pub fn driver_tool(driver_root: &std::path::Path, relative: &str) -> std::path::PathBuf {
    let name = std::path::Path::new(relative).file_name().unwrap_or_default();
    TOOL_DIRS
        .iter()
        .map(|d| driver_root.join(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| driver_root.join(relative))
}
