//! Finding the NVIDIA driver's user-space files under a driver root.
//!
//! Libraries are every `*.so.<driver version>` in the usual library folders (and their
//! `vdpau/` subfolders); binaries are the tools a GPU container expects; firmware is the
//! GSP firmware of that version. Paths are host paths (under the driver root); the CDI spec
//! mounts each at the same path minus the driver root. Results are cached per driver root
//! and version, since the files only change with a driver upgrade.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Library folders searched, relative to the driver root.
pub const LIBRARY_DIRS: [&str; 8] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
];
/// Binary folders searched, relative to the driver root.
pub const BINARY_DIRS: [&str; 5] = ["usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin"];
/// Binaries mounted into GPU containers.
pub const BINARIES: [&str; 5] =
    ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"];
/// IPC sockets of the driver's daemons (first match of each group), relative to the root.
pub const IPC_SOCKETS: [[&str; 2]; 2] = [
    ["run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket"],
    ["run/nvidia-fabricmanager/socket", "var/run/nvidia-fabricmanager/socket"],
];
/// Firmware folders searched, relative to the driver root.
pub const FIRMWARE_DIRS: [&str; 2] = ["lib/firmware/nvidia", "usr/lib/firmware/nvidia"];

/// The driver's files on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// The driver root the paths are under.
    pub root: PathBuf,
    /// The driver version they belong to (empty when unknown).
    pub version: String,
    /// Library files (host paths).
    pub libraries: Vec<PathBuf>,
    /// Folders holding those libraries (host paths), in search order.
    pub library_dirs: Vec<PathBuf>,
    /// Binaries (host paths).
    pub binaries: Vec<PathBuf>,
    /// GSP firmware files (host paths).
    pub firmware: Vec<PathBuf>,
    /// Daemon IPC sockets found (host paths).
    pub ipc_sockets: Vec<PathBuf>,
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

fn is_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// Scans `root` for the files of driver `version`. A missing folder is not an error: the
/// result simply lists fewer files.
pub fn discover(root: &Path, version: &str) -> DriverFiles {
    let mut out = DriverFiles { root: root.to_path_buf(), version: version.to_string(), ..Default::default() };
    if version.is_empty() {
        return out;
    }
    let suffix = format!(".so.{version}");
    let mut seen_dirs = Vec::<PathBuf>::new();
    for rel in LIBRARY_DIRS {
        let base = root.join(rel);
        // Folders reached twice through a symlink (lib → usr/lib) are listed once.
        let Ok(canonical) = base.canonicalize() else { continue };
        if seen_dirs.contains(&canonical) {
            continue;
        }
        seen_dirs.push(canonical);
        for dir in [base.clone(), base.join("vdpau")] {
            let libs: Vec<PathBuf> = sorted_entries(&dir)
                .into_iter()
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(&suffix)) && is_file(p))
                .collect();
            if !libs.is_empty() {
                out.library_dirs.push(dir);
                out.libraries.extend(libs);
            }
        }
    }
    for name in BINARIES {
        if let Some(p) = BINARY_DIRS.iter().map(|d| root.join(d).join(name)).find(|p| is_file(p)) {
            out.binaries.push(p);
        }
    }
    for group in IPC_SOCKETS {
        let found = group
            .iter()
            .map(|rel| root.join(rel))
            .find(|p| std::fs::metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())));
        out.ipc_sockets.extend(found);
    }
    for rel in FIRMWARE_DIRS {
        let dir = root.join(rel).join(version);
        out.firmware.extend(sorted_entries(&dir).into_iter().filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("gsp") && n.ends_with(".bin"))
                && is_file(p)
        }));
        if !out.firmware.is_empty() {
            break;
        }
    }
    out
}

/// A per-(root, version) cache of [`discover`].
#[derive(Debug, Default)]
pub struct DriverFilesCache {
    entries: Mutex<HashMap<(PathBuf, String), Arc<DriverFiles>>>,
}

impl DriverFilesCache {
    /// The files of `version` under `root`, scanned on first use.
    pub fn get(&self, root: &Path, version: &str) -> Arc<DriverFiles> {
        let key = (root.to_path_buf(), version.to_string());
        if let Some(hit) = self.entries.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return hit.clone();
        }
        let files = Arc::new(discover(root, version));
        tracing::info!(
            driver_root = %root.display(),
            driver_version = version,
            libraries = files.libraries.len(),
            binaries = files.binaries.len(),
            firmware = files.firmware.len(),
            "found the driver's user-space files"
        );
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Old versions are dropped: after a driver upgrade only the new one is used.
        map.retain(|(r, _), _| r != root);
        map.insert(key, files.clone());
        files
    }
}
