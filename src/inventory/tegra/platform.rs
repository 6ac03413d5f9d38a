//! What a Jetson's own files say about it, read under the configured roots.
//!
//! Detection follows NVIDIA's libraries (go-nvlib's property extractor): a Jetson has
//! `/etc/nv_tegra_release` (under the driver root), or a `/sys/devices/soc0/family` that
//! starts with `tegra`. The module's model is the device tree's `model`, its SoC the
//! `nvidia,tegra<N>` entry of the device tree's `compatible` list, the L4T release the first
//! line of `nv_tegra_release` (`# R36 (release), REVISION: 4.3, ...` is 36.4.3), and the
//! memory the GPU may use is the system's RAM (`MemTotal` of `/proc/meminfo`), shared with
//! the CPU. Every file is read without following a link at its last component and only up
//! to [`MAX_FILE`] bytes; text that is not printable is ignored with a warning.

use std::path::{Path, PathBuf};

use crate::config::Paths;

/// The L4T release file, relative to the driver root.
pub const TEGRA_RELEASE: &str = "etc/nv_tegra_release";
/// The SoC family, relative to the sysfs root.
pub const SOC_FAMILY: &str = "devices/soc0/family";
/// The device tree's model, relative to the procfs root.
pub const DT_MODEL: &str = "device-tree/model";
/// The device tree's compatible list, relative to the procfs root.
pub const DT_COMPATIBLE: &str = "device-tree/compatible";
/// The kernel's memory summary, relative to the procfs root.
pub const MEMINFO: &str = "meminfo";
/// The most bytes read of any one of these files.
pub const MAX_FILE: u64 = 64 << 10;

/// What a Jetson's integrated GPU is, by SoC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocInfo {
    /// The device tree's SoC name, e.g. `tegra234`.
    pub soc: &'static str,
    /// The family NVIDIA names the module by, e.g. `Orin`.
    pub family: &'static str,
    /// The GPU's architecture.
    pub architecture: &'static str,
    /// The GPU's CUDA compute capability.
    pub compute_capability: &'static str,
}

/// The Jetson SoCs edra knows (NVIDIA's CUDA GPU tables; Thor is 11.0 from CUDA 13 on).
pub const SOCS: [SocInfo; 5] = [
    SocInfo { soc: "tegra210", family: "Nano", architecture: "Maxwell", compute_capability: "5.3" },
    SocInfo { soc: "tegra186", family: "TX2", architecture: "Pascal", compute_capability: "6.2" },
    SocInfo { soc: "tegra194", family: "Xavier", architecture: "Volta", compute_capability: "7.2" },
    SocInfo { soc: "tegra234", family: "Orin", architecture: "Ampere", compute_capability: "8.7" },
    SocInfo { soc: "tegra264", family: "Thor", architecture: "Blackwell", compute_capability: "11.0" },
];

/// Why edra takes this host for a Jetson.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// The L4T release file exists.
    ReleaseFile(PathBuf),
    /// sysfs names a Tegra SoC family.
    SocFamily(String),
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Evidence::ReleaseFile(p) => write!(f, "{} exists", p.display()),
            Evidence::SocFamily(family) => write!(f, "the SoC family is {family:?}"),
        }
    }
}

/// An L4T release: `R<major>`, `REVISION: <revision>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L4tRelease {
    /// The major release (36 for JetPack 6).
    pub major: u32,
    /// The revision as written, e.g. `4.3`.
    pub revision: String,
}

impl L4tRelease {
    /// The release as a semantic version: R36 revision 4.3 is `36.4.3`.
    pub fn version(&self) -> Option<String> {
        super::super::attributes::normalize_version(&format!("{}.{}", self.major, self.revision))
    }

    /// The JetPack major version of this L4T line, when known (R32 → 4, R35 → 5, R36 → 6,
    /// R38 → 7).
    pub fn jetpack_major(&self) -> Option<u32> {
        match self.major {
            32 => Some(4),
            35 => Some(5),
            36 => Some(6),
            38 => Some(7),
            _ => None,
        }
    }
}

/// Everything read about the platform.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Platform {
    /// The device tree's model, e.g. `NVIDIA Jetson AGX Orin Developer Kit`.
    pub model: Option<String>,
    /// The SoC, when the compatible list names a known one.
    pub soc: Option<SocInfo>,
    /// The SoC name from the compatible list even when unknown (`tegra234`).
    pub soc_name: Option<String>,
    /// The L4T release.
    pub l4t: Option<L4tRelease>,
    /// `MemTotal` in bytes.
    pub memory: Option<u64>,
}

/// Why this host is a Jetson, or `None`.
pub fn detect(paths: &Paths) -> Option<Evidence> {
    let release = paths.driver_root.join(TEGRA_RELEASE);
    if std::fs::symlink_metadata(&release).is_ok() {
        return Some(Evidence::ReleaseFile(release));
    }
    let family = read_text(&paths.sys_root.join(SOC_FAMILY))?;
    family.to_ascii_lowercase().starts_with("tegra").then_some(Evidence::SocFamily(family))
}

/// Reads the platform's facts; what cannot be read is left out.
pub fn read(paths: &Paths) -> Platform {
    let compatible = read_bytes(&paths.proc_root.join(DT_COMPATIBLE)).map(|b| parse_compatible(&b)).unwrap_or_default();
    let soc_name = compatible.iter().find_map(|c| c.strip_prefix("nvidia,tegra")).map(|n| format!("tegra{n}"));
    Platform {
        model: read_text(&paths.proc_root.join(DT_MODEL)),
        soc: soc_name.as_deref().and_then(|n| SOCS.iter().find(|s| s.soc == n).copied()),
        soc_name,
        l4t: read_text(&paths.driver_root.join(TEGRA_RELEASE)).and_then(|t| parse_release(&t)),
        memory: read_text(&paths.proc_root.join(MEMINFO)).and_then(|t| parse_mem_total(&t)),
    }
}

/// The L4T release in `nv_tegra_release`'s first line (`# R36 (release), REVISION: 4.3, ...`).
pub fn parse_release(text: &str) -> Option<L4tRelease> {
    let line = text.lines().next()?.trim().strip_prefix('#')?.trim();
    let major = line.strip_prefix('R')?;
    let digits = major.bytes().take_while(u8::is_ascii_digit).count();
    let major: u32 = major.get(..digits)?.parse().ok()?;
    let revision = line.split(',').find_map(|f| f.trim().strip_prefix("REVISION:"))?.trim();
    let plain =
        !revision.is_empty() && revision.len() <= 16 && revision.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    plain.then(|| L4tRelease { major, revision: revision.to_string() })
}

/// The entries of a device tree string list (NUL-separated), printable ones only.
pub fn parse_compatible(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_graphic()))
        .map(str::to_string)
        .collect()
}

/// `MemTotal` of `/proc/meminfo` in bytes.
pub fn parse_mem_total(text: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim();
    let kib: u64 = rest.strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024).filter(|b| *b > 0)
}

/// Whether NVML's name for a GPU is a Jetson's integrated GPU: Orin's (`Orin (nvgpu)`) or
/// Thor's (`NVIDIA Thor`).
pub fn is_integrated_name(name: &str) -> bool {
    name.contains("(nvgpu)") || name.contains("NVIDIA Thor")
}

fn read_bytes(path: &Path) -> Option<Vec<u8>> {
    match crate::util::read_small_file(path, MAX_FILE) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a Jetson platform file; left out");
            None
        }
    }
}

/// The file's text up to its first NUL, trimmed; `None` when absent, empty or not
/// printable text (tabs and line breaks aside).
fn read_text(path: &Path) -> Option<String> {
    let bytes = read_bytes(path)?;
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let text = std::str::from_utf8(&bytes[..end]).ok().map(str::trim);
    match text {
        Some("") => None,
        Some(t) if !t.chars().any(|c| c != '\n' && c != '\t' && crate::util::is_control(c)) => Some(t.to_string()),
        _ => {
            tracing::warn!(path = %path.display(), "not printable text; left out");
            None
        }
    }
}
