//! Kernel-enforced GPU memory limits per cgroup (v2), the driver's "memory partitioning"
//! (r615 / CUDA 13.4 and newer): `nvmlDeviceSetMemoryLimits_v1` sets a soft and a hard
//! limit for one GPU on one cgroup directory, enforced by the kernel's `dmem` controller
//! (kernel 6.14 and newer) or by the driver's own accounting (its `misc` fallback).
//!
//! This module finds out whether the node can ([`detect`]), sets and clears limits through
//! the loaded NVML library ([`LimitControl`], [`nvml::NvmlLimits`]), turns an OCI
//! `linux.cgroupsPath` into the container's cgroup ([`cgroup`]), tells when a container's
//! processes are gone ([`exits`]), and defines what the hook and the agent say to each
//! other ([`wire`]). Like the rest of `gpu`, it records nothing: the caller records a limit
//! before it is set. docs/sharing.md has the sources.

pub mod cgroup;
pub mod exits;
pub mod nvml;
pub mod wire;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: a hard limit meaning "no limit" (with a soft limit of 0).
pub const LIMIT_MAX: u64 = u64::MAX;
/// The NVML function that sets a cgroup's limits.
pub const SET_SYMBOL: &str = "nvmlDeviceSetMemoryLimits_v1";
/// The NVML function that reads them.
pub const GET_SYMBOL: &str = "nvmlDeviceGetMemoryLimits_v1";

/// Why a limit could not be set, cleared or read.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The NVML library could not be loaded or lacks a function.
    #[error("{0}")]
    Unavailable(String),
    /// The GPU is not known to NVML.
    #[error("NVML does not know GPU {uuid} ({message})")]
    UnknownGpu {
        /// The GPU.
        uuid: String,
        /// NVML's error.
        message: String,
    },
    /// NVML refused the call.
    #[error("{call} on GPU {uuid} for cgroup {} failed: {message}", cgroup.display())]
    Nvml {
        /// The function.
        call: &'static str,
        /// The GPU.
        uuid: String,
        /// The cgroup directory.
        cgroup: PathBuf,
        /// NVML's error, with its number.
        message: String,
        /// NVML's return code.
        code: u32,
    },
}

impl LimitError {
    /// Whether NVML said the cgroup directory cannot be opened (`NVML_ERROR_OPERATING_SYSTEM`):
    /// gone, which also clears its limits.
    pub fn cgroup_gone(&self) -> bool {
        matches!(self, LimitError::Nvml { code: 17, .. })
    }
}

/// A cgroup's limits on one GPU, as NVML reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Soft limit, bytes (0: none).
    pub soft: u64,
    /// Hard limit, bytes ([`LIMIT_MAX`]: none).
    pub hard: u64,
    /// Memory the cgroup uses on the GPU, bytes.
    pub used: u64,
}

/// Sets and reads per-cgroup GPU memory limits.
pub trait LimitControl: Send + Sync {
    /// Sets `soft` and `hard` (bytes) for GPU `uuid` on the cgroup directory `cgroup`.
    fn set(&self, uuid: &str, cgroup: &Path, soft: u64, hard: u64) -> Result<(), LimitError>;
    /// Reads the limits of GPU `uuid` on `cgroup`.
    fn get(&self, uuid: &str, cgroup: &Path) -> Result<Limits, LimitError>;
    /// Clears the limits: the soft limit to 0 (which also gives back the reservation the
    /// driver added to the cgroup's ancestors) and the hard limit to [`LIMIT_MAX`].
    fn clear(&self, uuid: &str, cgroup: &Path) -> Result<(), LimitError> {
        self.set(uuid, cgroup, 0, LIMIT_MAX)
    }
}

/// What enforces the limits on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The kernel's `dmem` cgroup controller.
    Dmem,
    /// The driver's own per-cgroup accounting (its `misc` fallback).
    Misc,
}

impl Backend {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Dmem => "the kernel's dmem cgroup controller",
            Backend::Misc => "the driver's own per-cgroup accounting (its misc fallback)",
        }
    }
}

/// What [`detect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    /// The backend, when the node can enforce limits.
    pub backend: Option<Backend>,
    /// Why it can, or why not (each missing requirement), in words.
    pub reasons: Vec<String>,
}

impl Detection {
    /// One line: which enforcement and why.
    pub fn summary(&self) -> String {
        match self.backend {
            Some(b) => format!("GPU memory limits per container are available, enforced by {}", b.name()),
            None => format!("GPU memory limits per container are not available: {}", self.reasons.join("; ")),
        }
    }
}

/// Where detection looks: the NVML library candidates (in the order the backend tries
/// them), `<sys_root>/fs/cgroup` and `<proc_root>/driver/nvidia/params`.
#[derive(Debug, Clone)]
pub struct Host<'a> {
    /// The NVML library files or names to try.
    pub libraries: &'a [PathBuf],
    /// sysfs.
    pub sys_root: &'a Path,
    /// procfs.
    pub proc_root: &'a Path,
}

/// The cgroup v2 root under `sys_root`.
pub fn cgroup_root(sys_root: &Path) -> PathBuf {
    sys_root.join("fs/cgroup")
}

/// Finds out whether this node can enforce per-cgroup GPU memory limits: NVML has
/// [`SET_SYMBOL`] and [`GET_SYMBOL`], the cgroup hierarchy is v2, and the driver's memory
/// accounting is not turned off (`RmMemacctMode=0`); the backend is dmem when the cgroup
/// root offers the `dmem` controller with an NVIDIA region, else the driver's fallback.
/// Returns the loaded control when available.
pub fn detect(host: &Host<'_>) -> (Detection, Option<nvml::NvmlLimits>) {
    let mut reasons = Vec::new();
    let control = match nvml::NvmlLimits::open(host.libraries) {
        Ok(c) => {
            reasons.push(format!("{} has {SET_SYMBOL}", c.library().display()));
            Some(c)
        }
        Err(e) => {
            reasons.push(e.to_string());
            None
        }
    };
    let root = cgroup_root(host.sys_root);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok();
    let v2 = controllers.is_some();
    if !v2 {
        reasons.push(format!(
            "{} is not a cgroup v2 hierarchy (no cgroup.controllers); the limits need cgroup v2",
            root.display()
        ));
    }
    let mode = memacct_mode(host.proc_root);
    if mode == Some(0) {
        reasons.push("the driver's memory accounting is turned off (RmMemacctMode=0 in NVreg_RegistryDwords)".into());
    }
    let dmem = controllers.as_deref().is_some_and(|c| c.split_whitespace().any(|w| w == "dmem"));
    let nvidia_region = std::fs::read_to_string(root.join("dmem.capacity"))
        .is_ok_and(|c| c.lines().any(|l| l.trim_start().starts_with("nvidia")));
    let backend = match (control.is_some(), v2, mode) {
        (true, true, Some(0)) | (false, _, _) | (_, false, _) => None,
        (true, true, Some(1)) => Some(Backend::Misc),
        (true, true, _) if dmem && nvidia_region => Some(Backend::Dmem),
        (true, true, _) => Some(Backend::Misc),
    };
    match backend {
        Some(Backend::Dmem) => reasons.push("cgroup v2 with the dmem controller and an NVIDIA region".into()),
        Some(Backend::Misc) if dmem => reasons.push(
            "cgroup v2 with the dmem controller but no NVIDIA region in dmem.capacity (or RmMemacctMode=1): the driver \
             accounts itself"
                .into(),
        ),
        Some(Backend::Misc) => {
            reasons.push("cgroup v2 without the dmem controller (kernel < 6.14?): the driver accounts itself".into())
        }
        None => {}
    }
    (Detection { backend, reasons }, if backend.is_some() { control } else { None })
}

/// `RmMemacctMode` from the driver's `RegistryDwords` in `<proc_root>/driver/nvidia/params`
/// (`RmMemacctMode=<n>` among `;`-separated entries); `None` when absent or unreadable.
pub fn memacct_mode(proc_root: &Path) -> Option<u32> {
    let params = std::fs::read(proc_root.join("driver/nvidia/params")).ok()?;
    let params = String::from_utf8_lossy(&params[..params.len().min(1 << 16)]).into_owned();
    parse_memacct_mode(&params)
}

/// [`memacct_mode`] of the params text.
pub fn parse_memacct_mode(params: &str) -> Option<u32> {
    let line = params.lines().find_map(|l| l.strip_prefix("RegistryDwords:"))?;
    let value = line.trim().trim_matches('"');
    value.split([';', ',']).find_map(|entry| {
        let (key, v) = entry.split_once('=')?;
        if !key.trim().eq_ignore_ascii_case("RmMemacctMode") {
            return None;
        }
        let v = v.trim();
        match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    })
}
