//! Finding the NVIDIA driver's user-space files under a driver root.
//!
//! Libraries are every `*.so.<driver version>` in the usual library folders and their
//! `vdpau/` subfolders, plus `libnvidia-nvvm70.so.*` (versioned on its own); binaries are
//! the tools a GPU container expects; firmware is the GSP firmware of that version, searched
//! where the kernel looks for it; IPC paths are the daemons' sockets and the MPS pipe folder.
//! The library symlinks the host has (`libcuda.so.1` → `libcuda.so.<version>`) are listed
//! so the `create-symlinks` hook recreates them in the container, and whether the driver
//! may create device nodes (its procfs params), which calls for the
//! `disable-device-node-modification` hook. Paths are host paths (under
//! the driver root); the CDI spec mounts each at the same path minus the driver root.
//! Results are cached per driver root and version, since the files only change with a
//! driver upgrade. A Jetson's files are not found this way: its platform lists them in CSV
//! files ([`csv`]).

pub mod csv;

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Library folders searched, relative to the driver root.
pub const LIBRARY_DIRS: [&str; 10] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
    "usr/local/nvidia/lib64",
    "usr/local/nvidia/lib",
];
/// Libraries versioned independently of the driver: file name prefixes.
pub const UNVERSIONED_LIBRARIES: [&str; 1] = ["libnvidia-nvvm70.so."];
/// Binary folders searched, relative to the driver root.
pub const BINARY_DIRS: [&str; 6] = ["usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin", "usr/local/nvidia/bin"];
/// Binaries mounted into GPU containers.
pub const BINARIES: [&str; 5] =
    ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"];
/// IPC sockets of the driver's daemons (first match of each group), relative to the root.
pub const IPC_SOCKETS: [[&str; 2]; 2] = [
    ["run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket"],
    ["run/nvidia-fabricmanager/socket", "var/run/nvidia-fabricmanager/socket"],
];
/// The MPS control daemon's pipe folder, relative to the root.
pub const MPS_PIPE_DIR: &str = "tmp/nvidia-mps";
/// The kernel's custom firmware path setting, relative to the sysfs root.
pub const FIRMWARE_PATH_PARAM: &str = "module/firmware_class/parameters/path";
/// The running kernel's release, relative to the procfs root.
pub const OS_RELEASE: &str = "sys/kernel/osrelease";
/// The library SONAMEs edra links even where the host lacks the link (`libcuda.so.1`),
/// with the development link made to point at them (`libcuda.so`).
pub const KNOWN_SONAMES: [(&str, &str); 1] = [("libcuda.so.1", "libcuda.so")];

/// Where the host's sysfs and procfs are (for the firmware search path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoots {
    /// The sysfs root (`/sys`).
    pub sys_root: PathBuf,
    /// The procfs root (`/proc`).
    pub proc_root: PathBuf,
}

impl Default for HostRoots {
    fn default() -> Self {
        Self { sys_root: "/sys".into(), proc_root: "/proc".into() }
    }
}

/// A symlink to recreate in the container: `dir/name` → `target` (a file name in `dir`, or
/// for a link a Jetson's CSV files list, the link's own target text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryLink {
    /// The folder (host path, one of the library folders).
    pub dir: PathBuf,
    /// The link's file name.
    pub name: String,
    /// What it points to, a file name in the same folder.
    pub target: String,
}

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
    /// Library symlinks to recreate in the container (SONAME and development links).
    pub library_links: Vec<LibraryLink>,
    /// Binaries (host paths).
    pub binaries: Vec<PathBuf>,
    /// GSP firmware files (host paths).
    pub firmware: Vec<PathBuf>,
    /// Daemon IPC sockets and the MPS pipe folder found (host paths).
    pub ipc_paths: Vec<PathBuf>,
    /// The driver may create device nodes (`ModifyDeviceFiles: 1` in its procfs params),
    /// so containers need the `disable-device-node-modification` hook.
    pub modify_device_files: bool,
    /// Device nodes every container of these files needs (host paths under the device
    /// root): a Jetson's, from its CSV files ([`csv`]).
    pub device_nodes: Vec<PathBuf>,
    /// Folders mounted read-only whole (host paths): a Jetson's CSV `dir` entries.
    pub directories: Vec<PathBuf>,
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

fn file_name(p: &Path) -> Option<&str> {
    p.file_name().and_then(|n| n.to_str())
}

/// True for a path usable under a root: absolute, no `..`.
fn is_plain_absolute(p: &Path) -> bool {
    p.is_absolute() && p.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// The folders the kernel loads firmware from, in its order (absolute, on the host): the
/// custom path set in sysfs, then `/lib/firmware/updates/<release>`, `/lib/firmware/updates`,
/// `/lib/firmware/<release>`, `/lib/firmware`, and `/usr/lib/firmware` (unmerged `/usr`).
pub fn firmware_search_path(host: &HostRoots) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let custom = std::fs::read_to_string(host.sys_root.join(FIRMWARE_PATH_PARAM)).unwrap_or_default();
    let custom = Path::new(custom.trim());
    if is_plain_absolute(custom) && custom != Path::new("/") {
        out.push(custom.to_path_buf());
    }
    let release = std::fs::read_to_string(host.proc_root.join(OS_RELEASE)).unwrap_or_default();
    let release = release.trim();
    let release =
        (!release.is_empty() && release != "." && release != ".." && !release.contains('/')).then_some(release);
    if let Some(r) = release {
        out.push(Path::new("/lib/firmware/updates").join(r));
    }
    out.push("/lib/firmware/updates".into());
    if let Some(r) = release {
        out.push(Path::new("/lib/firmware").join(r));
    }
    out.push("/lib/firmware".into());
    out.push("/usr/lib/firmware".into());
    out
}

/// Under `root`, the absolute host path `abs`.
fn under(root: &Path, abs: &Path) -> PathBuf {
    root.join(abs.strip_prefix("/").unwrap_or(abs))
}

/// The symlinks in `dir` that point (directly, or through one other link) at one of the
/// `libs` file names, plus the [`KNOWN_SONAMES`] links of those libraries.
fn library_links(dir: &Path, libs: &[String]) -> Vec<LibraryLink> {
    let mut out: Vec<LibraryLink> = Vec::new();
    let mut push = |name: &str, target: &str| {
        if !out.iter().any(|l| l.name == name) {
            out.push(LibraryLink { dir: dir.to_path_buf(), name: name.into(), target: target.into() });
        }
    };
    for (soname, dev_link) in KNOWN_SONAMES {
        let stem = soname.rsplit_once(".so.").map_or(soname, |(s, _)| s);
        let prefix = format!("{stem}.so.");
        // The driver's file is the longest `<stem>.so.<version>` name (never the SONAME).
        if let Some(file) = libs.iter().filter(|l| l.starts_with(&prefix) && l.as_str() != soname).max() {
            push(soname, file);
            push(dev_link, soname);
        }
    }
    let links: Vec<(String, String)> = sorted_entries(dir)
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()))
        .filter_map(|p| {
            let name = file_name(&p)?.to_string();
            let target = std::fs::read_link(&p).ok()?;
            let target = target.to_str()?.to_string();
            let plain = |s: &str| !s.is_empty() && !s.contains(['/', '\0', '\n']) && s != "." && s != "..";
            (name.starts_with("lib") && plain(&name) && plain(&target)).then_some((name, target))
        })
        .collect();
    for (name, target) in &links {
        if libs.contains(target) {
            push(name, target);
        }
    }
    for (name, target) in &links {
        let via_soname = links.iter().any(|(n, t)| n == target && libs.contains(t));
        if via_soname {
            push(name, target);
        }
    }
    out
}

/// Scans `root` for the files of driver `version`. A missing folder is not an error: the
/// result simply lists fewer files.
pub fn discover(root: &Path, version: &str, host: &HostRoots) -> DriverFiles {
    let mut out = DriverFiles { root: root.to_path_buf(), version: version.to_string(), ..Default::default() };
    if version.is_empty() {
        return out;
    }
    let suffix = format!(".so.{version}");
    let is_library = |name: &str| name.ends_with(&suffix) || UNVERSIONED_LIBRARIES.iter().any(|p| name.starts_with(p));
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
                .filter(|p| file_name(p).is_some_and(is_library) && is_file(p))
                .collect();
            if !libs.is_empty() {
                let names: Vec<String> = libs.iter().filter_map(|p| file_name(p).map(str::to_string)).collect();
                out.library_links.extend(library_links(&dir, &names));
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
        out.ipc_paths.extend(found);
    }
    let mps = root.join(MPS_PIPE_DIR);
    if std::fs::metadata(&mps).is_ok_and(|m| m.is_dir()) {
        out.ipc_paths.push(mps);
    }
    out.modify_device_files = std::fs::read_to_string(host.proc_root.join(crate::hook::device_params::PARAMS))
        .is_ok_and(|t| crate::hook::device_params::rewrite(&t).is_some());
    // Per file name, the first folder wins, as when the kernel loads it.
    let mut firmware_names = Vec::<String>::new();
    for dir in firmware_search_path(host) {
        let dir = under(root, &dir).join("nvidia").join(version);
        for p in sorted_entries(&dir) {
            let Some(name) = file_name(&p) else { continue };
            if name.starts_with("gsp")
                && name.ends_with(".bin")
                && !firmware_names.iter().any(|n| n == name)
                && is_file(&p)
            {
                firmware_names.push(name.to_string());
                out.firmware.push(p);
            }
        }
    }
    out
}

/// A per-(root, version) cache of [`discover`].
#[derive(Debug, Default)]
pub struct DriverFilesCache {
    host: HostRoots,
    entries: Mutex<HashMap<(PathBuf, String), Arc<DriverFiles>>>,
}

impl DriverFilesCache {
    /// An empty cache that reads the firmware search path from `host`.
    pub fn new(host: HostRoots) -> Self {
        Self { host, entries: Mutex::default() }
    }

    /// The files of `version` under `root`, scanned on first use.
    pub fn get(&self, root: &Path, version: &str) -> Arc<DriverFiles> {
        let key = (root.to_path_buf(), version.to_string());
        if let Some(hit) = self.entries.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return hit.clone();
        }
        let files = Arc::new(discover(root, version, &self.host));
        tracing::info!(
            driver_root = %root.display(),
            driver_version = version,
            libraries = files.libraries.len(),
            binaries = files.binaries.len(),
            firmware = files.firmware.len(),
            library_links = files.library_links.len(),
            "found the driver's user-space files"
        );
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Old versions are dropped: after a driver upgrade only the new one is used.
        map.retain(|(r, _), _| r != root);
        map.insert(key, files.clone());
        files
    }
}

#[cfg(test)]
mod tests;
